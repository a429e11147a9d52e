// A chat client on Supabase Realtime: the client, its channels (broadcast, presence, postgres changes).
export { RealtimeClient } from "@supabase/realtime-js";
