"""Moving jobs: the planner (pure), and later the journaled executor and daemon."""
