"""Cycle model of the transmit engine (filled in below)."""


def isolated_write(posted, qp, *, dma_latency):
    raise NotImplementedError
