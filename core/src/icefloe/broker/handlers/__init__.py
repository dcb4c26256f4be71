"""One module per Kafka API family; each exposes ``async def handle_<api>(ctx, request)``."""
