"""Shared cluster state behind one interface: metadata records, broker registrations, controller.

:mod:`kcli.cluster.state` holds the interface; :mod:`kcli.cluster.local` keeps it in the data
dir (the single-node default), :mod:`kcli.cluster.postgres` in a PostgreSQL database shared by
several brokers. The broker only talks to the interface (see :func:`kcli.cluster.factory.open_store`).
"""
