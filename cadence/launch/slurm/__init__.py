"""Runs on a Slurm cluster: `cadence slurm submit|task|add-workers|status|stop`.

```
 login node: cadence slurm submit CONFIG --out DIR
   ─► DIR/config.json (run id fixed), DIR/slurm/{control,rollout}.sbatch (a few lines each)
   ─► sbatch control (--requeue, --signal=USR1@120) ─► sbatch rollout × R (--dependency=after:control)
   ─► DIR/slurm/jobs.json: every job id with its role
 control job, srun one task a node: cadence slurm task --role control DIR
   node 0: the address of the interface that routes to the cluster (or --ifname) ─► dispatcher bound
           there (writes DIR/dispatcher.addr) ─► trainer and its publisher (under torchrun on N nodes,
           c10d rendezvous at node 0); requeued with a resume checkpoint ─► both --resume
   node i: the trainer's torchrun, node rank i
   SIGUSR1 (before the time limit) ─► trainer: resume checkpoint after this period ─► scontrol requeue
   DIR/slurm/stop ─► the same checkpoint ─► the dispatcher ends the run (summary.json), everyone stops
 rollout job: cadence slurm task --role rollout DIR ─► wait for DIR/dispatcher.addr ─► cadence rollout
           --name rollout-<job id> (the same name after a requeue); the dispatcher gone before the run
           ended (its job requeued) ─► start again against the address it writes next
```

The sbatch scripts only call `cadence slurm task`; every decision (which node runs what, which
address, whether to resume) is Python here, tested by faking `SLURM_*` variables.
"""
