"""The requester: from doorbell to packets, ACKs to completions and CQEs."""
