"""The one door to the Docker Engine: its API client, its calls and errors, its streams and its events."""
