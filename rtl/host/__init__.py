"""What the host (CPU and GPU) writes: control registers and UAR doorbells."""
