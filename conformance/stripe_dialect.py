"""Drives `asiento psp-sim --dialect stripe` with Stripe's official Python library.

Run by crates/cli/tests/stripe_library.rs with the venv scripts/test builds from
conformance/requirements.txt. Arguments come from the environment:

- ASIENTO_BIN: the asiento binary (its psp-sim subcommand is started here);

Each check raises on a mismatch; the process exits non-zero with the traceback, which the cargo
test prints. The library is used as a merchant's code uses it: module-level api_key and
api_base, resources' create/confirm/capture/retrieve/list (balance transactions with their
sources expanded, payouts, and events), errors as exceptions, and
Webhook.construct_event on every event the simulator delivered.
"""

import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

import stripe

SECRET = "whsec_conformance_0123456789"


class Receiver(http.server.BaseHTTPRequestHandler):
    deliveries = []
    lock = threading.Lock()

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        with Receiver.lock:
            Receiver.deliveries.append((self.headers.get("Stripe-Signature"), body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def start_receiver():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def start_simulator(webhook_url):
    process = subprocess.Popen(
        [
            os.environ["ASIENTO_BIN"],
            "psp-sim",
            "--dialect",
            "stripe",
            "--listen",
            "127.0.0.1:0",
            "--seed",
            "11",
            "--fee-bps",
            "290",
            "--webhook-url",
            webhook_url,
            "--webhook-secret",
            SECRET,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        line = process.stdout.readline()
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            return process, match.group(1)
    process.kill()
    raise RuntimeError("psp-sim did not say where it listens")


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def main():
    receiver = start_receiver()
    webhook_url = "http://127.0.0.1:%d/hook" % receiver.server_address[1]
    simulator, base = start_simulator(webhook_url)
    try:
        run_checks(base)
    finally:
        simulator.terminate()
        simulator.wait(timeout=10)
        receiver.shutdown()
    print("stripe conformance: ok")


def run_checks(base):
    stripe.api_key = "sk_test_conformance"
    stripe.api_base = base
    stripe.max_network_retries = 0

    # Create (unconfirmed), confirm, capture part, refund part.
    create = dict(
        amount=2000,
        currency="usd",
        payment_method="pm_card_visa",
        payment_method_types=["card"],
        capture_method="manual",
        metadata={"asiento_payment_id": "pay_conformance", "order": "42"},
        idempotency_key="conformance-create",
    )
    intent = stripe.PaymentIntent.create(**create)
    check(isinstance(intent, stripe.PaymentIntent), "create answers a PaymentIntent")
    check(intent.status == "requires_confirmation", intent.status)
    check(intent.metadata["order"] == "42", intent.metadata)
    again = stripe.PaymentIntent.create(**create)
    check(again.id == intent.id, "the same key answers the same PaymentIntent")
    check(
        again.last_response.headers.get("Idempotent-Replayed") == "true",
        "a replay is marked",
    )

    confirmed = stripe.PaymentIntent.confirm(intent.id, idempotency_key="conformance-confirm")
    check(confirmed.status == "requires_capture", confirmed.status)
    check(confirmed.amount_capturable == 2000, confirmed.amount_capturable)

    captured = stripe.PaymentIntent.capture(
        intent.id, amount_to_capture=1500, idempotency_key="conformance-capture"
    )
    check(captured.status == "succeeded", captured.status)
    check(captured.amount_received == 1500, captured.amount_received)

    refund = stripe.Refund.create(
        payment_intent=intent.id, amount=500, idempotency_key="conformance-refund"
    )
    check(isinstance(refund, stripe.Refund), "a refund answers a Refund")
    check(refund.status == "succeeded" and refund.amount == 500, refund)
    check(stripe.Refund.retrieve(refund.id).id == refund.id, "a refund is read by id")

    # Retrieve with expand: the charge and its balance transaction come as objects.
    read = stripe.PaymentIntent.retrieve(intent.id, expand=["latest_charge.balance_transaction"])
    charge = read.latest_charge
    check(isinstance(charge, stripe.Charge), type(charge))
    check(charge.amount_captured == 1500 and charge.amount_refunded == 500, charge)
    txn = charge.balance_transaction
    check(isinstance(txn, stripe.BalanceTransaction), type(txn))
    check((txn.amount, txn.fee, txn.net) == (1500, 44, 1456), (txn.amount, txn.fee, txn.net))
    check(charge.refunds.data[0].id == refund.id, charge.refunds)

    # List with auto-paging: every PaymentIntent once, newest first.
    made = [intent.id]
    for n in range(4):
        made.append(
            stripe.PaymentIntent.create(
                amount=100 + n, currency="usd", payment_method_types=["card"]
            ).id
        )
    listed = [pi.id for pi in stripe.PaymentIntent.list(limit=2).auto_paging_iter()]
    check(listed == list(reversed(made)), (listed, made))

    # Balance transactions, auto-paged with their sources expanded: the capture net of Stripe's
    # fee and the refund, each naming the PaymentIntent it moved money for.
    moved = list(
        stripe.BalanceTransaction.list(limit=1, expand=["data.source"]).auto_paging_iter()
    )
    ours = [t for t in moved if t.source.payment_intent == intent.id]
    kinds = sorted((t.type, t.amount, t.fee, t.net) for t in ours)
    check(kinds == [("charge", 1500, 44, 1456), ("refund", -500, 0, -500)], kinds)
    check(isinstance(ours[0], stripe.BalanceTransaction), type(ours[0]))
    check(
        stripe.BalanceTransaction.retrieve(txn.id).net == 1456,
        "a balance transaction is read by id",
    )

    # A payout (made through the simulator's control route, as Stripe's schedule would) reads
    # back through the library, with the balance transactions it paid out.
    payouts = urllib.request.urlopen(
        urllib.request.Request(base + "/sim/payouts", data=b"{}", method="POST")
    )
    made = json.loads(payouts.read())["data"]
    check(len(made) == 1 and made[0]["amount"] == 1456 - 500, made)
    payout = stripe.Payout.retrieve(made[0]["id"])
    check(isinstance(payout, stripe.Payout) and payout.status == "paid", payout)
    listed = [p.id for p in stripe.Payout.list(limit=1).auto_paging_iter()]
    check(listed == [payout.id], listed)
    paid = sorted(
        t.type for t in stripe.BalanceTransaction.list(payout=payout.id).auto_paging_iter()
    )
    # What it paid out, and its own withdrawal.
    check(paid == ["charge", "payout", "refund"], paid)

    # A decline raises the library's CardError, with the PaymentIntent it was made on.
    try:
        stripe.PaymentIntent.create(
            amount=700,
            currency="usd",
            payment_method="pm_card_chargeDeclined",
            payment_method_types=["card"],
            confirm=True,
        )
        raise AssertionError("a declined card did not raise")
    except stripe.CardError as error:
        check(error.http_status == 402, error.http_status)
        check(error.code == "card_declined", error.code)
        declined = error.error.payment_intent
        check(declined.id.startswith("pi_"), declined)
        check(declined.status == "requires_payment_method", declined.status)

    # A parameter Stripe does not have is an InvalidRequestError naming it.
    try:
        stripe.PaymentIntent.create(amount=100, currency="usd", colour="blue")
        raise AssertionError("an unknown parameter did not raise")
    except stripe.InvalidRequestError as error:
        check(error.param == "colour", error.param)
        check(error.code == "parameter_unknown", error.code)

    # The same key with other parameters is an IdempotencyError.
    try:
        stripe.PaymentIntent.create(
            amount=1, currency="usd", idempotency_key="conformance-create"
        )
        raise AssertionError("a reused key did not raise")
    except stripe.IdempotencyError:
        pass

    # Every event the simulator delivered verifies with construct_event.
    expected = {
        "payment_intent.amount_capturable_updated",
        "charge.succeeded",
        "payment_intent.succeeded",
        "charge.captured",
        "payment_intent.payment_failed",
        "charge.failed",
    }
    deadline = time.time() + 10
    seen = set()
    while time.time() < deadline and not expected <= seen:
        with Receiver.lock:
            deliveries = list(Receiver.deliveries)
        seen = set()
        for header, body in deliveries:
            event = stripe.Webhook.construct_event(body.decode("utf-8"), header, SECRET)
            check(isinstance(event, stripe.Event), type(event))
            seen.add(event.type)
        time.sleep(0.1)
    check(expected <= seen, "events seen: %s" % sorted(seen))
    header, body = deliveries[0]
    try:
        stripe.Webhook.construct_event(body.decode("utf-8") + " ", header, SECRET)
        raise AssertionError("a changed body verified")
    except stripe.SignatureVerificationError:
        pass
    try:
        stripe.Webhook.construct_event(body.decode("utf-8"), header, "whsec_other")
        raise AssertionError("another secret verified")
    except stripe.SignatureVerificationError:
        pass

    # The same events, listed (a type group, auto-paged) and retrieved, delivered or not.
    listed = list(stripe.Event.list(type="payment_intent.*", limit=2).auto_paging_iter())
    kinds = {event.type for event in listed}
    check("payment_intent.succeeded" in kinds, kinds)
    check(all(event.type.startswith("payment_intent.") for event in listed), kinds)
    check(len({event.id for event in listed}) == len(listed), "an event listed twice")
    retrieved = stripe.Event.retrieve(listed[0].id)
    check(isinstance(retrieved, stripe.Event) and retrieved.id == listed[0].id, retrieved)
    check(retrieved.data.object.object == "payment_intent", retrieved)


if __name__ == "__main__":
    sys.exit(main())
