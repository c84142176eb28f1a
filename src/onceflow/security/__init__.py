"""Security, sans-IO: listeners, SASL authentication, SCRAM credentials and ACLs.

Nothing here opens a socket or knows the broker: the broker's connection layer hands
bytes to `sasl.SaslSession`, asks `acl.Authorizer` about (principal, host, operation,
resource) and keeps users and ACLs in a `store.SecurityStore` (one small durable file
in the data directory). See docs/security.md.
"""
