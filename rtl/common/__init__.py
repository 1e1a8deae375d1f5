"""Records, stream and AXI helpers, header layouts and CRC math shared by every role."""
