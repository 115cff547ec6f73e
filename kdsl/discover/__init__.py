"""The main job: the discover loop, its evaluators and executors, the accuracy proxy and the report."""
