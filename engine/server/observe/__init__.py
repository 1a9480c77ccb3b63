"""What is shown of the engine: recent requests, the cache page, metrics, cache figures.

`activity` keeps what the front end saw of recent requests; `cache_view` builds the
cache page's tree; `metrics` records Prometheus metrics; `figures` rounds the cache
figures a client is told. Plain records the front end and the servicer feed.

It imports nothing of the server but `errors`.
"""
