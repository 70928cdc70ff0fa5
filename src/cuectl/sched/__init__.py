"""Scheduling: the job model, frame ranges, job specs, device matching and the stores.

What a job is: ``model`` (specs, states), ``frameset`` (frame ranges), ``gpu_request`` and
``match`` (what a frame asks of a device, and which devices fit), ``logname`` (an attempt
log's name). How one enters: ``intake`` (the one front door: read, recognise, load),
``spec`` (YAML/JSON and flag-form specs), ``opencue_xml``, ``openjd``, ``checks`` and
``fields`` (validators), ``services``, ``notify``, ``identity`` (who submitted it, proven),
``preview`` (``submit --dry-run``). Where it lives: ``store/`` (the ``Store`` interface,
SQLite, PostgreSQL, the socket client), ``dialect`` (where their SQL differs),
``usage_sql`` (accounting sums). What is said about it: ``views`` (JSON shapes),
``pending`` and ``why`` (why frames wait), ``hostfilter``, ``wait`` (``job wait``).
"""
