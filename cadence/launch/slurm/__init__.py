"""Runs on a Slurm cluster: `cadence slurm submit|task|add-workers|status|stop`.

```
 login node: cadence slurm submit CONFIG --out DIR
   ─► checked first: the folder, every partition, sbatch --test-only of both scripts (nothing written)
   ─► DIR/config.json (run id fixed), DIR/slurm/{control,rollout}.sbatch (a few lines each)
   ─► sbatch control (--requeue, --signal=USR1@120) ─► sbatch rollout × R (--dependency=after:control)
   ─► DIR/slurm/jobs.json: every job id with its role (a later refusal: all cancelled, all removed)
 control job, srun one task a node: cadence slurm task --role control DIR
   node 0: the address of the interface that routes to the cluster (or --ifname) ─► dispatcher bound
           there (writes DIR/dispatcher.addr) ─► trainer and its publisher (under torchrun on N nodes,
           c10d rendezvous at node 0); requeued with a resume checkpoint ─► both --resume;
           requeued with periods recorded and no checkpoint ─► refuses (never counts a period twice)
   node i: the trainer's torchrun, node rank i
   SIGUSR1 (before the time limit) ─► trainer: resume checkpoint after this period ─► scontrol requeue
   DIR/slurm/stop ─► the same checkpoint, the trainer's last ─► its row recorded ─► the dispatcher
           ends the run (summary.json at the checkpoint's version), everyone stops, every job COMPLETED
 rollout job: cadence slurm task --role rollout DIR ─► wait for DIR/dispatcher.addr ─► cadence rollout
           --name rollout-<job id> (the same name after a requeue); the dispatcher gone before the run
           ended (its job requeued) ─► start again against the address it writes next; the worker
           lost while its dispatcher still runs (DIR/dispatcher.alive fresh: a network blip) ─► start
           again against the same one; while there is none: the control job ended ─► give up, logged
           (the job FAILED); else wait, logged, at most rollout.wait_for_dispatcher_s
 status / stop / add-workers ─► the jobs' states (squeue, scontrol) and the run folder: a dead control
           job named, a silent dispatcher (DIR/dispatcher.alive stale) told from a running one; the
           dispatcher's view of each worker beside Slurm's
```

The sbatch scripts only call `cadence slurm task`; every decision (which node runs what, which
address, whether to resume) is Python here, tested by faking `SLURM_*` variables.
"""
