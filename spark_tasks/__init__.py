"""PySpark jobs for kcli's heavy scans (dump-log over many objects, diskless verify and gc).

Imported only when the Spark engine runs (``--engine spark`` or ``auto`` when it estimates Spark faster):
importing pyspark and starting its JVM is far too slow for every kcli command. Each
``<job>_job.run`` takes a :class:`kcli.engine.chunks.ChunkTask` and yields its results in item order;
the task itself (the same object the local engine runs) does the per-object work.
"""
