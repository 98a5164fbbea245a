-- No query reads the inbox by payment reference; the index cost an entry per stored webhook
-- and per non-HOT update (the worker's mark) on the hot path. An operator looking for one
-- payment's webhooks scans the table (`where payment_ref = 'pay_…'`), or creates the index.
drop index if exists webhook_inbox_payment;
