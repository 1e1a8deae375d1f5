"""The responder: received requests checked, payload written, ACK/NAKs built."""
