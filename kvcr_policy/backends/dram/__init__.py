"""The local DRAM tier: placement (:mod:`.tier`), slots and claims (:mod:`.store`), eviction,
and the copy transports that move bytes between a pool and its region (:mod:`.transports`)."""
