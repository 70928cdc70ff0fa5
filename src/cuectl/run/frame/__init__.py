"""One frame attempt, in the rooms of its launch: ``env`` (what the frame is and the
environment it runs with), ``tokens`` (its command's ``#TOKEN#``s), ``start`` (starting its
command as its user, in its directory) and ``process`` (the running attempt, its kill and
how it ended). ``cuectl.run.launch`` re-exports what the worker uses of them."""
