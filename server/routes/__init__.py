"""The server's HTTP routes, one router per concern (server/app.py assembles them)."""
