// Package atropos owns the Atropos environment bridge: a runner sink that
// feeds scored groups to a NousResearch Atropos trainer through its
// trajectory API (run-api), acting as one Atropos environment.
//
// A Bridge (New) registers with POST /register-env, retrying while the API
// is down and waiting while it answers "wait for trainer to start"; reads
// GET /info; then polls GET /status-env (a GET with a JSON body) and
// throttles: while the trainer's queue plus the bridge's own undelivered and
// admitted groups hold MaxBatchesOffPolicy batches, Admit blocks, so the
// runner pauses intake and never cancels a running rollout. Intake stops
// (runner.ErrIntakeStopped) once the trainer's step budget is reached.
//
// WriteGroup converts a group with the trajectory package's Atropos export
// (trajectory.AtroposGroups over the Parquet records of assemble), so
// the trainer receives exactly what the trajectory files hold: tokens,
// masks (-100 on untrained positions), scores, inference_logprobs (1.0 on
// untrained positions), messages. The group is appended to an fsynced
// JSONL spool before it is sent; a sender goroutine POSTs spooled groups in
// order, gzip'd, to /scored_data (several at once to /scored_data_list),
// with env_id filled in at send time. 5xx, 404/409/410, 408/429 and
// connection errors are retried with jittered exponential backoff and make
// the bridge confirm its registration before sending again; other 4xx move
// the group to the spool's dead letters with the reason and, by default,
// stop intake with that error. When /status-env shows that the API forgot
// the env (unknown env_id, or current_step going backwards), the bridge
// registers again and replays the spool under the new env_id, so an API
// outage or restart loses no group and sends none twice (except the one
// group in flight if this process crashes, as the API has no idempotency
// key).
//
// OpenRun builds the bridge of one run from its config's atropos keys
// (runner.Config.Atropos), with the spool in the run directory so that a
// resumed run replays it; `rollout run --atropos-url` and the server's jobs
// (through server.Options.JobSinks, wired by `rollout serve`) use it, and
// RunBridge.Finish ends it with the run's outcome.
//
// docs/atropos.md describes running against an Atropos API.
package atropos
