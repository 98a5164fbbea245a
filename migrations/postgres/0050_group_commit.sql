-- Group commit writes a whole batch of requests (keys claimed, events, keys
-- completed, webhook rows) as one autocommit statement (app::group_statement).
-- When one request of the batch cannot be written whole (a stream moved on, a
-- key's lease was taken over), the statement calls this: the error undoes the
-- whole statement, so nothing of the batch is committed, and the application
-- writes each request alone to tell which one failed and why.
create function asiento_batch_refused(reason text) returns boolean
language plpgsql as $$
begin
    raise exception 'group commit batch refused: %', reason
        using errcode = 'AB001';
end
$$;
