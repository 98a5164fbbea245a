-- Room on each page of the webhook inbox for the row's next version.
--
-- A row is updated twice right after it is written: the worker's claim (lease columns, which no
-- index covers) and its end (status). With full pages the claim's new version goes to another
-- page, and every one of the inbox's five indexes gets an entry for it; with room on the page it
-- is a heap-only (HOT) update that touches no index. Only pages written from now on keep the
-- room: existing rows are not rewritten.
alter table webhook_inbox set (fillfactor = 60);
