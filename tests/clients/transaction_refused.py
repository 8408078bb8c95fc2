"""redis-py's transactional pipeline through a proxy whose upstream refuses the connection the
transaction needs (tests/fidelity.rs starts it). Prints one JSON line: what the client saw and
what it applied, read back over the same proxy once a connection is free again."""

import json
import sys

import redis

host, port = sys.argv[1], int(sys.argv[2])
client = redis.Redis(host=host, port=port, socket_timeout=10, retry_on_timeout=False)

outcome = {}
pipe = client.pipeline(transaction=True)
pipe.incr("counter")
pipe.incr("counter")
try:
    outcome["result"] = pipe.execute()
except redis.exceptions.RedisError as e:
    outcome["error"] = type(e).__name__ + ": " + str(e)
# A plain command afterwards runs, outside any transaction.
outcome["after"] = client.get("counter")
outcome["after"] = None if outcome["after"] is None else outcome["after"].decode()
print(json.dumps(outcome))
