"""What a training run owns, whichever trainer runs it: checkpoints, run state (agent + buffer
build, restore, save), TensorBoard telemetry, evaluation episodes, torch runtime settings.
"""
