// Typed REST calls: method + path + body + answer all come from src/rest.ts, which
// openapi-typescript generates from the server's /openapi.json (npm run gen:rest).
import type { paths } from "./rest.js";

export type Method = "get" | "put" | "post" | "patch" | "delete";
/** Paths of the API that have an operation for this method. */
export type PathsWith<M extends Method> = { [P in keyof paths]: paths[P] extends { [K in M]: object } ? P : never }[keyof paths];
export type Operation<P extends keyof paths, M extends Method> = NonNullable<paths[P][M]>;

type Json<C> = C extends { content: { "application/json": infer T } } ? T : never;
/** The JSON body an operation takes (never when it takes none). */
export type RequestBody<O> = O extends { requestBody?: infer R } ? Json<NonNullable<R>> : never;
/** The JSON an operation answers with on success (200, 201 or 202; null for 204). */
export type Answer<O> = O extends { responses: infer R }
  ? R extends { 200: infer A } ? Json<A> : R extends { 201: infer A } ? Json<A>
    : R extends { 202: infer A } ? Json<A> : R extends { 204: unknown } ? null : unknown
  : unknown;
type PathParams<O> = O extends { parameters: { path?: infer PP } } ? NonNullable<PP> : never;
type QueryParams<O> = O extends { parameters: { query?: infer Q } } ? NonNullable<Q> : never;

export type ApiArgs<O> =
  & ([PathParams<O>] extends [never] ? { path?: undefined } : { path: PathParams<O> })
  & ([QueryParams<O>] extends [never] ? { query?: undefined } : { query?: QueryParams<O> })
  & ([RequestBody<O>] extends [never] ? { body?: undefined } : { body: RequestBody<O> });

/** Fill {name} placeholders and add the query string. */
export function buildPath(template: string, path?: Record<string, unknown>, query?: Record<string, unknown>): string {
  let p = template.replace(/\{(\w+)\}/g, (_, k: string) => {
    const v = path?.[k];
    if (v === undefined || v === null) throw new Error(`missing path parameter ${k} for ${template}`);
    return encodeURIComponent(String(v));
  });
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined && v !== null) q.set(k, String(v));
  const qs = q.toString();
  if (qs) p += `?${qs}`;
  return p;
}
