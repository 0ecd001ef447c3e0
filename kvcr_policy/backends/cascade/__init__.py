"""The ``cascade`` tier: a ``dram`` tier in front of a ``file`` tier, as one placement policy.

- :mod:`.options`   the two levels' options and the admission rule
- :mod:`.pool`      one pool on both levels: presence, demotion, promotion, stats
- :mod:`.transfer`  a get across both levels
- :mod:`.backend`, :mod:`.hooks`  the backend behind the seam and its registration
"""
