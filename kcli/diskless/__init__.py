"""Diskless topics (KIP-1163): the broker side of partitions whose data lives in WAL objects in
object storage. :mod:`appender` buffers produces into objects and commits them through the batch
coordinator; :mod:`reader` and :mod:`engine` serve fetches; :mod:`wal` is the object format;
:mod:`cleaner` and :mod:`compaction` delete and compact; :mod:`admin_views` answer kcli's admin
requests. The batch coordinator itself is a plugin (plugins/coordinator)."""
