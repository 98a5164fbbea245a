-- How far each events relay (crates/relay) has published the merchant events feed to NATS
-- JetStream: the seq of the last feed event JetStream acknowledged, one row per relay (its stream
-- and tenant set). Moved forward by compare-and-set, only after the acknowledgements.
create table events_relay_cursors (
    relay      text   primary key,
    seq        bigint not null check (seq >= 0),
    updated_ms bigint not null
);
