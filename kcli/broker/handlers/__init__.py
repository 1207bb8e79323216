"""One module per family of Kafka APIs. A handler decodes nothing itself and decides nothing a
component owns: it checks the request's shape, calls the broker, a coordinator or a storage
feature, and turns their errors into the API's error codes (never a dropped connection)."""
