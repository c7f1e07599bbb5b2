"""``make demo``: the whole idea of zkbeat in one command, on the example project.

It starts its own ZooKeeper and Redis on free loopback ports (the test
suite's server classes), migrates example_project on SQLite, starts a worker
and three ``celery beat`` replicas with zkbeat.DatabaseScheduler, narrates
who leads and every publish, kills the leader with SIGKILL right after it
publishes a broadcast, stops the next leader with SIGTERM, and ends with a
table: publishes per entry and tick, ticks published twice, ticks missed, and
how long each handover took. Everything it started is stopped on the way out,
Ctrl-C included; its logs stay in .demo/.
"""
