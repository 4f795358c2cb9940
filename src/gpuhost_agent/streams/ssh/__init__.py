"""The rentals' SSH endpoint: who logs in where, sessions, files, forwards, the host key."""
