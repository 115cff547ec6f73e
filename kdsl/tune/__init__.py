"""Schedule tuning: one driver and records store, OpEvo, Gensor-style construction, ALT and MetaSchedule."""
