"""Memory on the device a model runs on: free bytes checked before allocating, and host
values uploaded to it without waiting."""
