"""roll-view: a local web page over a run's per-sample traces (docs/traces.md, "roll-view")."""
