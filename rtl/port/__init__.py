"""The Ethernet port: MAC RX to descriptors and beats, frames to MAC TX."""
