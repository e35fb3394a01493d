"""botocore (AWS's own Python client) against the mock's Bedrock wire: proves that the mock's
SigV4 checker accepts botocore's signatures and refuses a wrong one, and that its Converse
answers and binary event stream are what AWS's client parses. Prints one JSON report line."""

import json
import os

import botocore.session
from botocore.config import Config
from botocore.exceptions import ClientError

keys = json.loads(os.environ["AWS_KEYS"])
url = os.environ["MOCK_URL"]
session = botocore.session.get_session()
config = Config(retries={"max_attempts": 1, "mode": "standard"})


def client(secret, key_id=keys["access_key_id"], token=keys.get("session_token")):
    return session.create_client(
        "bedrock-runtime",
        region_name="us-west-2",
        endpoint_url=url,
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        aws_session_token=token,
        config=config,
    )


good = client(keys["secret_access_key"])
model = "us.anthropic.claude-sonnet-4-20250514-v1:0"
messages = [{"role": "user", "content": [{"text": "hello from botocore"}]}]
report = {}
answer = good.converse(modelId=model, messages=messages)
report["converse"] = answer["output"]["message"]["content"][0]["text"]
text = ""
stop = None
for event in good.converse_stream(modelId=model, messages=messages)["stream"]:
    if "contentBlockDelta" in event:
        text += event["contentBlockDelta"]["delta"].get("text", "")
    if "messageStop" in event:
        stop = event["messageStop"]["stopReason"]
report["stream"] = text
report["stream_stop"] = stop
for name, bad in [("forged", client("not-the-secret")), ("unknown_key", client("x", key_id="AKIAUNKNOWNKEY000000", token=None))]:
    try:
        bad.converse(modelId=model, messages=messages)
        report[name] = "accepted"
    except ClientError as err:
        report[name] = err.response["Error"]["Code"]
print(json.dumps(report))
