"""Checks the notifications of `asiento psp-sim --dialect adyen` with Adyen's official Python library.

Run by crates/cli/tests/adyen_library.rs with the venv scripts/test builds from
conformance/requirements.txt. The test runs the dialect, makes payments and modifications
through plain HTTP, collects every batch its receiver accepted, and hands them here.
Arguments come from the environment:

- ASIENTO_ADYEN_BATCHES: a file holding a JSON array of the delivered batches (each a
  NotificationRequest body as it was received);
- ASIENTO_ADYEN_HMAC_KEY: the hex HMAC key the dialect signed with;
- ASIENTO_ADYEN_EVENT_CODES: the event codes that must be among the items, comma-separated.

`Adyen.util.is_valid_hmac_notification` checks only `notificationItems[0]` when given a batch,
so every item is checked on its own: each must be valid, and a copy with any one signed field
changed (or signed under another key) must not. Each check raises on a mismatch; the process
exits non-zero with the traceback, which the cargo test prints.
"""

import copy
import importlib.metadata
import json
import os
import sys

from Adyen.util import is_valid_hmac_notification

SIGNED_FIELDS = [
    "pspReference",
    "originalReference",
    "merchantAccountCode",
    "merchantReference",
    "eventCode",
    "success",
]


def tampered_copies(item):
    """Copies of `item` with one signed value changed each."""
    for field in SIGNED_FIELDS:
        changed = copy.deepcopy(item)
        changed[field] = (changed.get(field) or "") + "x"
        yield field, changed
    for part in ("value", "currency"):
        changed = copy.deepcopy(item)
        if part == "value":
            changed["amount"]["value"] += 1
        else:
            changed["amount"]["currency"] = "USD" if item["amount"]["currency"] != "USD" else "EUR"
        yield "amount." + part, changed


def main():
    key = os.environ["ASIENTO_ADYEN_HMAC_KEY"]
    with open(os.environ["ASIENTO_ADYEN_BATCHES"], encoding="utf-8") as handle:
        batches = json.load(handle)
    wanted = {code for code in os.environ["ASIENTO_ADYEN_EVENT_CODES"].split(",") if code}
    other_key = ("00" if not key.startswith("00") else "11") + key[2:]
    seen = set()
    checked = 0
    for batch in batches:
        assert batch["live"] == "false", batch
        items = batch["notificationItems"]
        assert items, batch
        # Given the batch, the library reads its first item only.
        assert is_valid_hmac_notification(batch, key) is True, batch
        for wrapper in items:
            item = wrapper["NotificationRequestItem"]
            assert isinstance(item["success"], str), item
            assert is_valid_hmac_notification(item, key) is True, item
            assert is_valid_hmac_notification(item, other_key) is False, item
            for field, changed in tampered_copies(item):
                assert is_valid_hmac_notification(changed, key) is False, (field, item)
            seen.add(item["eventCode"])
            checked += 1
    missing = wanted - seen
    assert not missing, f"no item of {sorted(missing)} among {sorted(seen)}"
    print(f"Adyen {importlib.metadata.version('Adyen')}: {checked} items in {len(batches)} "
          "batches valid, every tampered copy refused")


if __name__ == "__main__":
    try:
        main()
    except Exception:
        import traceback

        traceback.print_exc()
        sys.exit(1)
