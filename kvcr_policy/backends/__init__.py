"""Tier backends: the places that hold pages, behind one interface (:mod:`.base`).

- :mod:`.dram`: a process-owned DRAM region per pool, moved with cpu threads or cuda streams
- :mod:`.peer`: another process's DRAM tier (``kvcr-policy serve``) over UCX
"""
