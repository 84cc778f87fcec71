"""What the node says about itself: Prometheus metrics, logging, the event loop's lag."""
