"""The dispatcher's core, without sockets: the roster of peers, the ledger of a period's prompts, the
eval rounds, and the policy that chooses which worker gets which prompt. Everything here is
synchronous and takes its time from its caller; `cadence.actors.dispatcher` feeds it messages and
sends what it decides."""
