"""Security: ACLs and Kafka's StandardAuthorizer rules (acl), SASL/PLAIN (sasl) and SCRAM (scram),
as Kafka's ``security`` packages hold them. The per-API authorization of requests is the
broker's (kcli.broker.authz); this package knows nothing of requests."""
