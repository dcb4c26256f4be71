"""Kafka client histories, and a checker of their anomalies after Jepsen's Kafka workload.

A *history* records every operation Kafka clients performed during a run (typically one with
faults injected): each operation's invocation and its completion, with the outcome, as one
JSON object per line:

    {"index": 17, "time": 12.345, "process": 3, "type": "invoke", "f": "send", "value": ...}

- `index`: the event's position, increasing through the file. `time`: seconds since the run
  began. `process`: the client; it has at most one operation outstanding, and after a crash
  (`info`) it is never used again: a recreated client takes a new number.
- `type`: `invoke`, then exactly one completion: `ok` (it happened: acknowledged, or the
  transaction committed), `fail` (it certainly did not happen: aborted, or refused before
  being written), `info` (unknown: timeout, crash). An invocation still outstanding when the
  file ends counts as `info`.
- `f` and `value`:
  - `send`, a non-transactional produce: invoked `[["send", key, value], ...]`, completed
    `[["send", key, [offset, value]], ...]`;
  - `poll`, one consumer poll: invoked `[["poll"]]`, completed
    `[["poll", {key: [[offset, value], ...]}]]`, records in the order delivered;
  - `txn`, a transaction of sends and polls in any order, completed as above (`fail`:
    aborted);
  - `assign`: the keys now assigned (any change of assignment or position: a rebalance, a
    seek, a restart from committed offsets);
  - `commit`: `{key: offset}` committed (recorded, not checked; nor does Jepsen check it).

  Keys are strings ("topic/partition"); values are integers, never sent twice to one key.
  A `fail` or `info` completion may give a send as `[null, value]` or the bare value (offset
  unknown) and a poll as `["poll"]` (results unknown), or leave `value` out or null: the
  invocation's value then stands.

Optional fields: `error` (any JSON: why an operation failed or crashed) and, on a poll or
txn completion, `rebalanced` (keys whose assignment changed during the operation: their
records are not compared for order within it or against the process's previous poll).
Other fields are ignored; `time` is kept but not checked.

A run should end with polls that read every key from the start (after an `assign`): an
acknowledged write that no poll read is reported as `unseen`.

To check histories:

    python -m tests.history run.jsonl [more.jsonl ...] [--summary] [--no-ww-deps]

or `check(load(path))` from `tests.history.checker` and `tests.history.model`; `report.valid`
is False when an anomaly Kafka forbids was found. `checker` defines each anomaly.
"""
