// A chat client on Switchboard: the client (room handles, pushed presence, typing, resume, SSE fallback).
export { SwitchboardClient } from "../../../clients/js/src/index.ts";
