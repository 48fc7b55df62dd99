"""The local wing: what runs a job on this machine, below the local runner's verbs
(`submit.runners.local`). Above it, only those verbs, the detached supervisor's command
(`python -m submit _supervise`) and batch prediction jobs (their own `JobLife`, the
job's lock) use it.

- `plan`: the job as processes (one command, environment and TF_CONFIG per replica);
- `joblife`: a job's life on this machine (PREPARING, RUNNING, an ending state, everything
  stopped on every way out, the last copy of the job dir), written once;
- `mirror`: a job dir the replicas cannot write themselves, copied while the job runs;
- `supervisor`: one process per replica, restart policies, deadlines, stops by PID;
- `tuner`, `study`, `resume`: a tuning job's trials (each a supervised job), its Optuna
  study, and `resumePreviousJobId`;
- `entry`: what the local runner calls: a plain job or a study, checked and run.

Nothing here imports `submit.runners` or `submit.lifecycle`: the wing is driven from
above and writes the job record itself (its supervisor owns it).
"""
