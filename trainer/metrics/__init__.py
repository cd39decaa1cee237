"""What a run reports: metric loggers, validation and step metrics under verl's names, rollout
scoring, and rollout traces (tags, listing)."""
