-- Users, roles, tokens and rooms.
--
-- Passwords are hashed by the server (argon2/bcrypt: the hashing work scales
-- with replicas, not on the database); the database only stores the hash and
-- refuses anything that does not look like one. The application role cannot
-- SELECT password_hash (column grants); it reads a hash only through
-- login_lookup(). Changes that affect live sessions (role, disabled, logout,
-- room membership) are announced on channel switchboard_control at COMMIT so
-- every replica re-checks that user's sockets within a second.
--
-- An announcement is a hint naming ids only ({"kind": "user", "user_id"},
-- {"kind": "revoke", "jti"}, {"kind": "member", "room", "user_id"}): any role
-- that can connect may pg_notify on the channel, so a replica re-reads the
-- state itself (user_states, revoked_among, is_room_member) before acting.
-- A forged hint costs one read and changes nothing.
--
-- Token epochs: a role change, a password change and disabling a user bump
-- users.token_epoch; tokens carry the epoch they were issued in and a
-- replica refuses older ones, so those changes revoke every existing token.

-- Inlined into its callers like _wake_workers: no SET clause, qualified names.
CREATE OR REPLACE FUNCTION switchboard._announce(msg jsonb)
RETURNS void
LANGUAGE sql
AS $$ SELECT pg_catalog.pg_notify('switchboard_control', msg::pg_catalog.text) $$;
REVOKE ALL ON FUNCTION switchboard._announce(jsonb) FROM PUBLIC;

-- The identity of a username (issue 21): its NFKC normal form, ASCII
-- case-folded, so 'Alice' and 'ALICE' are one user. Stored names are ASCII
-- (users_username_check), so the ASCII branch needs no normalize() (which also
-- needs a UTF8 database). V0012 creates it first, for the unique index
-- users_username_folded_key; this copy is the definition (same text). The
-- server applies the same rule (bounded.fold_username) to its login throttle
-- bucket and device cookie.
CREATE OR REPLACE FUNCTION switchboard.fold_username(name text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$
    SELECT pg_catalog.lower(
        (CASE WHEN name OPERATOR(pg_catalog.~) '^[\x01-\x7f]*$' THEN name
              ELSE pg_catalog.normalize(name, 'NFKC') END) COLLATE "C")
$$;
COMMENT ON FUNCTION switchboard.fold_username(text) IS
    'The identity of a username: NFKC normal form, ASCII lower case. Unique over users (users_username_folded_key); login and find_user compare with it.';
REVOKE ALL ON FUNCTION switchboard.fold_username(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.fold_username(text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard._check_role(role text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF role IS NULL OR role NOT IN ('admin', 'member') THEN
        RAISE EXCEPTION 'invalid role "%"', role USING ERRCODE = '22023', HINT = 'A role is admin or member.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_role(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard._check_hash(password_hash text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF password_hash IS NULL OR password_hash !~ '^\$(argon2(id|i|d)|2[abxy]?)\$' THEN
        RAISE EXCEPTION 'password_hash is not an argon2 or bcrypt hash' USING ERRCODE = '22023',
            HINT = 'Hash passwords in the server (argon2id); never store a plain password.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_hash(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard.create_user(username text, password_hash text, role text DEFAULT 'member')
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_id uuid;
BEGIN
    IF username IS NULL OR username !~ '^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$' THEN
        RAISE EXCEPTION 'invalid username "%"', username USING ERRCODE = '22023',
            HINT = 'A username is 1 to 64 characters: letters, digits, _ . @ - (not starting with punctuation).';
    END IF;
    PERFORM switchboard._check_hash(password_hash);
    PERFORM switchboard._check_role(role);
    BEGIN
        INSERT INTO switchboard.users (username, password_hash, role)
        VALUES (username, password_hash, role) RETURNING id INTO v_id;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'user "%" already exists', username USING ERRCODE = '23505';
    END;
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION switchboard.create_user(text, text, text) IS
    'Create a user with an argon2/bcrypt hash (hashed by the server) and a role (admin or member). Returns the id. 23505 if the name is taken, compared case-insensitively (fold_username).';
REVOKE ALL ON FUNCTION switchboard.create_user(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.create_user(text, text, text) TO switchboard_app;

-- Every lookup by name compares identities (switchboard.fold_username):
-- 'ALICE' finds alice, through the unique index users_username_folded_key.
CREATE OR REPLACE FUNCTION switchboard.find_user(username text)
RETURNS TABLE (id uuid, username text, role text, disabled boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT u.id, u.username, u.role, u.disabled FROM switchboard.users u
       WHERE switchboard.fold_username(u.username) = switchboard.fold_username($1) $$;
COMMENT ON FUNCTION switchboard.find_user(text) IS 'Look a user up by name, compared case-insensitively after NFKC (fold_username; no password hash). No row if unknown.';
REVOKE ALL ON FUNCTION switchboard.find_user(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.find_user(text) TO switchboard_app;

-- login_lookup_v2: the user's row for verifying a login, with token_epoch (what
-- the issued token carries as "gen"). PL/pgSQL rather than LANGUAGE sql: a SQL
-- function with a SET clause is never inlined and is re-planned on every call;
-- PL/pgSQL caches its plan. (0.1's login_lookup, without token_epoch, was
-- dropped by V0026.)
CREATE OR REPLACE FUNCTION switchboard.login_lookup_v2(username text)
RETURNS TABLE (user_id uuid, password_hash text, role text, disabled boolean, token_epoch integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT u.id, u.password_hash, u.role, u.disabled, u.token_epoch
                   FROM switchboard.users u
                  WHERE switchboard.fold_username(u.username) = switchboard.fold_username(login_lookup_v2.username);
END
$$;
COMMENT ON FUNCTION switchboard.login_lookup_v2(text) IS
    'The one way the application reads a password hash, for verifying a login: the user''s id, hash, role, disabled flag and token_epoch, which the issued token carries (a role or password change, or disabling, moves it on and so revokes older tokens). No row if the user is unknown.';
REVOKE ALL ON FUNCTION switchboard.login_lookup_v2(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.login_lookup_v2(text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard._user_changed(user_id uuid)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v switchboard.users;
BEGIN
    SELECT * INTO v FROM switchboard.users u WHERE u.id = _user_changed.user_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user % does not exist', user_id USING ERRCODE = 'P0002';
    END IF;
    -- Ids only: replicas re-read role, disabled and token_epoch with user_states().
    PERFORM switchboard._announce(jsonb_build_object('kind', 'user', 'user_id', v.id));
END
$$;
REVOKE ALL ON FUNCTION switchboard._user_changed(uuid) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard.set_user_role(user_id uuid, role text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_old text;
BEGIN
    PERFORM switchboard._check_role(role);
    -- The old role, locked: whether this is a real change is decided on the row.
    SELECT u.role INTO v_old FROM switchboard.users u WHERE u.id = set_user_role.user_id FOR UPDATE;
    UPDATE switchboard.users u
       SET role = set_user_role.role, updated_at = now(),
           token_epoch = u.token_epoch + CASE WHEN u.role = set_user_role.role THEN 0 ELSE 1 END
     WHERE u.id = set_user_role.user_id;
    IF FOUND AND v_old IS DISTINCT FROM set_user_role.role THEN
        -- A real change: the sessions minted under the old role end too (V0011).
        PERFORM switchboard._end_user_sessions(user_id, 'role');
    END IF;
    PERFORM switchboard._user_changed(user_id);
END
$$;
COMMENT ON FUNCTION switchboard.set_user_role(uuid, text) IS
    'Change a user''s role (admin or member). A real change revokes the user''s existing tokens (token_epoch), ends its sessions and is announced at COMMIT: every replica closes the user''s sockets (1008) within a second.';
REVOKE ALL ON FUNCTION switchboard.set_user_role(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.set_user_role(uuid, text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.set_user_password_hash(user_id uuid, password_hash text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_hash(password_hash);
    UPDATE switchboard.users u SET password_hash = set_user_password_hash.password_hash, updated_at = now(),
           token_epoch = u.token_epoch + 1
     WHERE u.id = set_user_password_hash.user_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user % does not exist', user_id USING ERRCODE = 'P0002';
    END IF;
    -- A ticket minted with the old credentials must not open a socket after the change,
    -- and a refresh cookie must not outlive it (V0011).
    DELETE FROM switchboard.tickets t WHERE t.user_id = set_user_password_hash.user_id;
    PERFORM switchboard._end_user_sessions(user_id, 'password');
    PERFORM switchboard._user_changed(user_id);
END
$$;
COMMENT ON FUNCTION switchboard.set_user_password_hash(uuid, text) IS
    'Replace a user''s password hash (argon2/bcrypt, computed by the server). Revokes the user''s existing tokens, sessions (refresh tokens) and unused WebSocket tickets; every replica closes the user''s open sockets at COMMIT.';
REVOKE ALL ON FUNCTION switchboard.set_user_password_hash(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.set_user_password_hash(uuid, text) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.disable_user(user_id uuid)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE switchboard.users u SET disabled = true, updated_at = now(), token_epoch = u.token_epoch + 1
     WHERE u.id = disable_user.user_id;
    DELETE FROM switchboard.tickets t WHERE t.user_id = disable_user.user_id;
    PERFORM switchboard._end_user_sessions(user_id, 'disabled');
    PERFORM switchboard._user_changed(user_id);
END
$$;
COMMENT ON FUNCTION switchboard.disable_user(uuid) IS
    'Disable a user: tickets are dropped, its sessions end, its tokens are revoked for good (enable_user does not revive them), and at COMMIT every replica closes the user''s sockets (within a second).';
REVOKE ALL ON FUNCTION switchboard.disable_user(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.disable_user(uuid) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.enable_user(user_id uuid)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE switchboard.users u SET disabled = false, updated_at = now() WHERE u.id = enable_user.user_id;
    PERFORM switchboard._user_changed(user_id);
END
$$;
COMMENT ON FUNCTION switchboard.enable_user(uuid) IS 'Re-enable a disabled user (announced like disable_user).';
REVOKE ALL ON FUNCTION switchboard.enable_user(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.enable_user(uuid) TO switchboard_app;

-- Logout: the token id is remembered until the token would expire anyway,
-- and announced so every replica refuses it at once.
CREATE OR REPLACE FUNCTION switchboard.revoke_token(jti text, user_id uuid, expires_at timestamptz)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF jti IS NULL OR length(jti) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'invalid token id "%"', jti USING ERRCODE = '22023';
    END IF;
    INSERT INTO switchboard.revoked_tokens (jti, user_id, expires_at)
    VALUES (jti, user_id, coalesce(expires_at, now() + interval '1 day'))
    ON CONFLICT ON CONSTRAINT revoked_tokens_pkey DO NOTHING;
    PERFORM switchboard._announce(jsonb_build_object('kind', 'revoke', 'jti', jti));
END
$$;
COMMENT ON FUNCTION switchboard.revoke_token(text, uuid, timestamptz) IS
    'Revoke an access token (logout) on every replica until it would have expired.';
REVOKE ALL ON FUNCTION switchboard.revoke_token(text, uuid, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.revoke_token(text, uuid, timestamptz) TO switchboard_app;

-- What a replica needs to (re)build its view of revoked tokens and changed
-- users after it (re)connects its LISTEN connection and may have missed
-- announcements. A user whose last change is older than the token lifetime
-- needs no entry: every token issued before that change has expired. No server
-- calls it directly: auth_snapshot_v3 (62_sessions.sql) adds the ended sessions
-- to it. (0.1's auth_snapshot, without token_epoch, was dropped by V0026.)
CREATE OR REPLACE FUNCTION switchboard.auth_snapshot_v2(since interval DEFAULT '1 day')
RETURNS TABLE (kind text, id text, user_id uuid, role text, disabled boolean, token_epoch integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
-- PL/pgSQL (bound at first call, not at CREATE): the function files are also
-- applied on top of an older schema (pgmigrate -t N), before token_epoch exists.
BEGIN
    RETURN QUERY
    SELECT 'revoke'::text, r.jti, r.user_id, NULL::text, NULL::boolean, NULL::integer
      FROM switchboard.revoked_tokens r WHERE r.expires_at > now()
    UNION ALL
    SELECT 'user'::text, u.id::text, u.id, u.role, u.disabled, u.token_epoch
      FROM switchboard.users u WHERE u.disabled OR u.updated_at > now() - auth_snapshot_v2.since;
END
$$;
COMMENT ON FUNCTION switchboard.auth_snapshot_v2(interval) IS
    'Revoked tokens still valid, and users disabled or changed within since, with each user''s token_epoch: what a replica reloads after its LISTEN connection reconnects. Servers call auth_snapshot_v3, which adds the sessions ended within since.';
REVOKE ALL ON FUNCTION switchboard.auth_snapshot_v2(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.auth_snapshot_v2(interval) TO switchboard_app;

-- The replica's own read behind a "user" hint: batched (one call per LISTEN
-- wake-up for every user named since the last one). A user that does not
-- exist returns no row; the replica treats it as disabled.
CREATE OR REPLACE FUNCTION switchboard.user_states(user_ids uuid[])
RETURNS TABLE (user_id uuid, role text, disabled boolean, token_epoch integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(user_ids) > 10000 THEN
        RAISE EXCEPTION 'too many user ids (%)', cardinality(user_ids) USING ERRCODE = '22023',
            HINT = 'At most 10000 per call.';
    END IF;
    RETURN QUERY SELECT u.id, u.role, u.disabled, u.token_epoch
                   FROM switchboard.users u WHERE u.id = ANY (coalesce(user_ids, '{}'));
END
$$;
COMMENT ON FUNCTION switchboard.user_states(uuid[]) IS
    'Role, disabled flag and token epoch of the given users (no row for an unknown id): what a replica reads after a "user" announcement instead of trusting it.';
REVOKE ALL ON FUNCTION switchboard.user_states(uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.user_states(uuid[]) TO switchboard_app;

-- The replica's own read behind a "revoke" hint: which of these token ids are
-- really revoked (and until when).
CREATE OR REPLACE FUNCTION switchboard.revoked_among(jtis text[])
RETURNS TABLE (jti text, expires_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(jtis) > 10000 THEN
        RAISE EXCEPTION 'too many token ids (%)', cardinality(jtis) USING ERRCODE = '22023',
            HINT = 'At most 10000 per call.';
    END IF;
    RETURN QUERY SELECT r.jti, r.expires_at FROM switchboard.revoked_tokens r
                  WHERE r.jti = ANY (coalesce(jtis, '{}')) AND r.expires_at > now();
END
$$;
COMMENT ON FUNCTION switchboard.revoked_among(text[]) IS
    'The token ids among jtis that are revoked and not yet expired: what a replica reads after a "revoke" announcement.';
REVOKE ALL ON FUNCTION switchboard.revoked_among(text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.revoked_among(text[]) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.add_room_member(room text, user_id uuid)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF room IS NULL OR room !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' THEN
        RAISE EXCEPTION 'invalid room name "%"', room USING ERRCODE = '22023',
            HINT = 'A room name is 1 to 128 characters: letters, digits, _ . : -';
    END IF;
    IF user_id IS NULL OR NOT EXISTS (SELECT 1 FROM switchboard.users u WHERE u.id = add_room_member.user_id) THEN
        RAISE EXCEPTION 'user % does not exist', user_id USING ERRCODE = 'P0002';
    END IF;
    INSERT INTO switchboard.rooms (name) VALUES (room) ON CONFLICT ON CONSTRAINT rooms_pkey DO NOTHING;
    INSERT INTO switchboard.room_members (room, user_id) VALUES (room, user_id)
    ON CONFLICT ON CONSTRAINT room_members_pkey DO NOTHING;
    IF FOUND THEN
        PERFORM switchboard._announce(jsonb_build_object('kind', 'member', 'room', room, 'user_id', user_id));
        RETURN true;
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION switchboard.add_room_member(text, uuid) IS
    'Add user_id to room (the room is created on first member). True if added, false if already a member.';
REVOKE ALL ON FUNCTION switchboard.add_room_member(text, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.add_room_member(text, uuid) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.remove_room_member(room text, user_id uuid)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM switchboard.room_members m
     WHERE m.room = remove_room_member.room AND m.user_id = remove_room_member.user_id;
    IF FOUND THEN
        PERFORM switchboard._announce(jsonb_build_object('kind', 'member', 'room', room, 'user_id', user_id));
        RETURN true;
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION switchboard.remove_room_member(text, uuid) IS
    'Remove user_id from room; every replica drops the user''s sockets from the room stream. False if not a member.';
REVOKE ALL ON FUNCTION switchboard.remove_room_member(text, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.remove_room_member(text, uuid) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.is_room_member(room text, user_id uuid)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM switchboard.room_members m
                    WHERE m.room = is_room_member.room AND m.user_id = is_room_member.user_id);
END
$$;
COMMENT ON FUNCTION switchboard.is_room_member(text, uuid) IS 'True if user_id belongs to room.';
REVOKE ALL ON FUNCTION switchboard.is_room_member(text, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.is_room_member(text, uuid) TO switchboard_app;
