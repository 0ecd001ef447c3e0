"""Transports: the one interface (base), and the cpu, memory, cuda and ucx implementations."""
