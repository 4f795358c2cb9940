"""The sandbox: a renter's Compose file read once, judged, hardened and given its share."""
