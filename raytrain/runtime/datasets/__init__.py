"""``--data``: the driver reads and preprocesses each dataset (source), a feeder streams it (feed), each rank iterates its share (batches: ``ctx.dataset``)."""
