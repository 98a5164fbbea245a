//! What happens next, drawn from the seed's generator step by step (`step_once`): a new payment,
//! a retry with the same key and body, a capture, a refund, a transfer, a webhook (the latest
//! state of a charge, or a stale or repeated one, or an `operation.updated`), something done at
//! the provider without us, the clock moving, a sweep under a fault, a seal, or a crash while
//! idle. Commands mostly pick a payment in a state where they make sense, and sometimes any, so
//! that refusals are stored and replayed too.

use asiento_app::invariants::Sealer;
use asiento_app::ledger::NewTransfer;
use asiento_app::log;
use asiento_app::payments::NewPayment;
use asiento_domain::{
    AccountName, Amount, CaptureMode, Currency, CustomerId, PaymentId, PaymentStatus, ProviderName,
};
use asiento_psp::{Charge, ChargeStatus, DisputeStatus};
use serde_json::json;

use super::client::{tenant, Work};
use super::knobs::{CLOCK_JUMP_MS_MAX, CUSTOMERS, IDEMPOTENCY_LEASE_MS, METHODS, PROVIDER};
use super::world::{webhook_facts, Sim};

impl Sim {
    async fn op_create(&mut self) {
        let amount = *self.rng.pick(&[50, 999, 10_000, 123_457]);
        let customer = *self.rng.pick(&CUSTOMERS);
        let method = *self.rng.pick(&METHODS);
        let automatic = self.rng.chance(60);
        let body = json!({
            "amount_minor": amount,
            "currency": "USD",
            "customer": customer,
            "payment_method": method,
            "capture": if automatic { "automatic" } else { "manual" },
        });
        let payment = NewPayment {
            tenant: tenant(),
            amount: Amount::new(amount),
            currency: Currency::parse("USD").unwrap(),
            customer: CustomerId::parse(customer).unwrap(),
            provider: ProviderName::parse(PROVIDER).unwrap(),
            payment_method: method.to_owned(),
            capture_mode: if automatic {
                CaptureMode::Automatic
            } else {
                CaptureMode::Manual
            },
            description: None,
            metadata: serde_json::Map::new(),
        };
        let index = self.new_request(Work::Create(payment), "/v1/payments".into(), body.clone());
        self.note(format!("request #{index}: create {body}"));
        self.send(index).await;
    }

    async fn op_retry(&mut self) {
        if self.requests.is_empty() {
            return self.op_create().await;
        }
        // Unsettled requests first: that is what a client retries.
        let open: Vec<usize> = (0..self.requests.len())
            .filter(|&i| !self.requests[i].settled())
            .collect();
        let index = if !open.is_empty() && self.rng.chance(75) {
            *self.rng.pick(&open)
        } else {
            self.rng.below(self.requests.len() as u64) as usize
        };
        if self.rng.chance(50) {
            self.advance(IDEMPOTENCY_LEASE_MS + 1_000).await;
        }
        self.note(format!("request #{index}: retry"));
        self.send(index).await;
    }

    /// A payment the client knows of: usually one in a state where the command makes sense,
    /// sometimes any (a refused command is a stored rejection, worth replaying too).
    async fn known_payment(&mut self, fitting: &[PaymentStatus]) -> Option<PaymentId> {
        if self.payments.is_empty() {
            return None;
        }
        if self.rng.chance(80) {
            let mut fits = Vec::new();
            for &id in &self.payments {
                let status = log::load_payment(self.process.flow.store().as_ref(), id)
                    .await
                    .unwrap()
                    .aggregate
                    .record
                    .map(|record| record.status);
                if status.is_some_and(|status| fitting.contains(&status)) {
                    fits.push(id);
                }
            }
            if !fits.is_empty() {
                return Some(*self.rng.pick(&fits));
            }
        }
        Some(*self.rng.pick(&self.payments))
    }

    async fn payment_amount(&self, id: PaymentId) -> i64 {
        log::load_payment(self.process.flow.store().as_ref(), id)
            .await
            .unwrap()
            .aggregate
            .record
            .map_or(1, |record| record.amount.minor())
    }

    async fn op_capture(&mut self) {
        let Some(payment) = self.known_payment(&[PaymentStatus::Authorized]).await else {
            return self.op_create().await;
        };
        let full = self.payment_amount(payment).await;
        let amount = if self.rng.chance(50) {
            None
        } else {
            Some(self.rng.between(1, full))
        };
        let body = json!({ "amount_minor": amount });
        let route = format!("/v1/payments/{payment}/capture");
        let index = self.new_request(
            Work::Capture {
                payment,
                amount: amount.map(Amount::new),
            },
            route,
            body,
        );
        self.note(format!("request #{index}: capture {payment} {amount:?}"));
        self.send(index).await;
    }

    async fn op_refund(&mut self) {
        let Some(payment) = self
            .known_payment(&[PaymentStatus::Captured, PaymentStatus::PartiallyRefunded])
            .await
        else {
            return self.op_create().await;
        };
        let full = self.payment_amount(payment).await;
        // Mostly within what is left (so the provider sees it), sometimes anything.
        let left = log::load_payment(self.process.flow.store().as_ref(), payment)
            .await
            .unwrap()
            .aggregate
            .record
            .map_or(0, |record| {
                record.captured.minor() - record.refunded.minor()
            });
        let amount = if left > 0 && self.rng.chance(70) {
            self.rng.between(1, left)
        } else {
            self.rng.between(1, full)
        };
        let body = json!({ "amount_minor": amount });
        let route = format!("/v1/payments/{payment}/refunds");
        let index = self.new_request(
            Work::Refund {
                payment,
                amount: Amount::new(amount),
            },
            route,
            body,
        );
        self.note(format!("request #{index}: refund {payment} {amount}"));
        self.send(index).await;
    }

    async fn op_transfer(&mut self) {
        let customer = *self.rng.pick(&CUSTOMERS);
        let amount = self.rng.between(1, 20_000);
        let from = format!("customer:{customer}:available");
        let to = "merchant:acme:available".to_owned();
        let body = json!({"from": from, "to": to, "amount_minor": amount, "currency": "USD"});
        let transfer = NewTransfer {
            tenant: tenant(),
            from: AccountName::parse(&from).unwrap(),
            to: AccountName::parse(&to).unwrap(),
            amount: Amount::new(amount),
            currency: Currency::parse("USD").unwrap(),
            description: None,
            pending: false,
            expires_at: None,
        };
        let index = self.new_request(Work::Transfer(transfer), "/v1/transfers".into(), body);
        self.note(format!("request #{index}: transfer {amount} from {from}"));
        self.send(index).await;
    }

    /// A webhook: a state some charge passed through (usually its latest; sometimes a stale or
    /// repeated one), or an `operation.updated` the provider sent, applied as the worker applies
    /// it. A dark charge's webhooks (from its dispute on) never arrive.
    async fn op_webhook(&mut self) {
        let delivery = {
            let state = self.provider.state.lock().unwrap();
            let arrives =
                |charge: &Charge| !state.dark.contains(&charge.id) || charge.dispute.is_none();
            let choice = self.rng.below(100);
            if state.charges.is_empty() {
                None
            } else if choice < 35 && !state.events.is_empty() {
                let event = self.rng.pick(&state.events).clone();
                arrives(&event.charge).then(|| {
                    (
                        event.charge.clone(),
                        webhook_facts(&event.charge, Some(&event.operation)),
                    )
                })
            } else {
                let charge = if choice < 75 {
                    self.rng.pick(&state.charges).clone()
                } else {
                    self.rng.pick(&state.history).clone()
                };
                arrives(&charge).then(|| (charge.clone(), webhook_facts(&charge, None)))
            }
        };
        let Some((charge, facts)) = delivery else {
            return self.op_create().await;
        };
        let payment = PaymentId::parse(charge.reference.as_deref().unwrap()).unwrap();
        self.deliver(payment, &facts, "webhook").await;
    }

    /// What the provider does on its side: the customer finishes a redirect, the merchant
    /// refunds in the provider's dashboard, a cardholder disputes, a dispute is decided.
    fn op_provider_side(&mut self) {
        let charges = self.provider.charges();
        let fitting = |fits: &dyn Fn(&Charge) -> bool| -> Vec<usize> {
            (0..charges.len()).filter(|&i| fits(&charges[i])).collect()
        };
        let done = match self.rng.weighted(&[45, 15, 25, 15]) {
            0 => {
                let open = fitting(&|c| c.status == ChargeStatus::RequiresAction);
                let succeed = self.rng.chance(80);
                (!open.is_empty())
                    .then(|| *self.rng.pick(&open))
                    .and_then(|index| self.provider.complete_action(index, succeed))
            }
            1 => {
                let captured = fitting(&|c| c.status == ChargeStatus::Succeeded);
                let amount = self.rng.between(1, 50_000);
                (!captured.is_empty())
                    .then(|| *self.rng.pick(&captured))
                    .and_then(|index| self.provider.refund_out_of_band(index, amount))
            }
            2 => {
                let undisputed =
                    fitting(&|c| c.status == ChargeStatus::Succeeded && c.dispute.is_none());
                (!undisputed.is_empty())
                    .then(|| *self.rng.pick(&undisputed))
                    .and_then(|index| self.provider.open_dispute(index))
            }
            _ => {
                let disputed = fitting(&|c| {
                    c.dispute
                        .as_ref()
                        .is_some_and(|d| d.status == DisputeStatus::Open)
                });
                let won = self.rng.chance(50);
                (!disputed.is_empty())
                    .then(|| *self.rng.pick(&disputed))
                    .and_then(|index| self.provider.close_dispute(index, won))
            }
        };
        if let Some(done) = done {
            self.note(format!("provider: {done}"));
        }
    }

    async fn op_clock(&mut self) {
        let delta = *self.rng.pick(&[
            1_000,
            30_000,
            IDEMPOTENCY_LEASE_MS + 1_000,
            5 * 60_000,
            CLOCK_JUMP_MS_MAX,
        ]);
        self.note(format!("clock +{}s", delta / 1_000));
        self.advance(delta).await;
    }

    async fn op_sweep(&mut self) {
        let fault = self.random_fault();
        self.sweep(fault).await;
    }

    async fn op_seal(&mut self) {
        let sealer = Sealer::new(self.process.database.clone(), self.clock.clone());
        if let Err(error) = sealer.seal_once().await {
            self.fail(format!("sealing failed: {error}"));
        }
    }

    async fn op_idle_crash(&mut self) {
        self.note("process crashed while idle");
        self.restart().await;
    }

    pub async fn step_once(&mut self) {
        self.send_new_events().await;
        // create, retry, capture, refund, transfer, webhook, provider side, clock, sweep, seal,
        // idle crash
        match self.rng.weighted(&[20, 12, 12, 14, 4, 15, 10, 10, 6, 2, 2]) {
            0 => self.op_create().await,
            1 => self.op_retry().await,
            2 => self.op_capture().await,
            3 => self.op_refund().await,
            4 => self.op_transfer().await,
            5 => self.op_webhook().await,
            6 => self.op_provider_side(),
            7 => self.op_clock().await,
            8 => self.op_sweep().await,
            9 => self.op_seal().await,
            _ => self.op_idle_crash().await,
        }
    }
}
