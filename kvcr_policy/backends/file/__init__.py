"""The ``file`` tier: pages in slot files on a local file system, crash-consistent, reopened
with a self-check. How to read this folder, bottom up:

- :mod:`.records`   the commit record of one slot (its own CRC, the page's CRC, the key)
- :mod:`.directory` a pool's directory: files, lock, format, direct I/O probe, free-space floor
- :mod:`.inplace`   moves between the page cache and the pool itself (non-blocking reads)
- :mod:`.reads`     what one read carries (its run, the pages by the path that served them)
- :mod:`.engine`    batched vectored reads and writes on a bounded thread pool (why not io_uring):
  direct through staging buffers, or through the page cache, or both (``direct = "auto"``)
- :mod:`.index`     the durable index: tombstones before overwrites, records after the bytes
- :mod:`.recovery`  what a reopened directory still holds; damaged entries become misses
- :mod:`.tier`      one pool's tier: files, index, slot store (eviction) and I/O together
- :mod:`.transfer`  one get or set on a tier
- :mod:`.options`, :mod:`.backend`, :mod:`.hooks`, :mod:`.bench`  the backend behind the seam,
  its options, its registration and its benchmark adapter
"""
