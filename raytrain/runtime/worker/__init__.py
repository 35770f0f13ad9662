"""What every Ray Train worker runs: the train loop, ``ctx`` and its collaborators (engine, reports, guard, heartbeats, elastic resize, parallel layouts), script mode, rank logs."""
