"""What trains, whichever trainer runs it: the run state (agent + buffer build, ingest, save,
restore), the checkpoint schedule, telemetry and its sinks (TensorBoard, metrics.jsonl, W&B), the
update's thread tuner.
"""
