"""Interop with a real RoCE peer: Linux rdma_rxe in a qemu guest (see interop/README.md)."""
