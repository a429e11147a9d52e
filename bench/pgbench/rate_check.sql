-- switchboard.rate_check on a random key from a pool of 10,000 (rate 1000/s, burst 1000).
\set k random(1, 10000)
SELECT * FROM switchboard.rate_check('k' || :k, 1000, 1000);
