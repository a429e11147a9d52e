"""The HTTP resources, one module per area; app.py holds the route table."""
