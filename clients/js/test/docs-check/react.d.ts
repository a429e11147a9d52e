// A minimal ambient `react` for type-checking the React example in docs/how-to/frontend.md
// (tests/test_js_client.py::test_the_react_example_in_the_docs_compiles) without
// adding an npm dependency. Signatures follow @types/react 19 for what the example
// uses -- including that there is no global JSX namespace any more (React.JSX).
declare module "react" {
  export type Key = string | number | bigint;
  export interface ReactElement<P = unknown> { type: unknown; props: P; key: string | null }
  export type ReactNode = ReactElement | string | number | bigint | boolean | null | undefined | Iterable<ReactNode>;
  export type Dispatch<A> = (value: A) => void;
  export type SetStateAction<S> = S | ((prevState: S) => S);
  export type DependencyList = readonly unknown[];
  export type EffectCallback = () => void | (() => void);
  export function useState<S>(initialState: S | (() => S)): [S, Dispatch<SetStateAction<S>>];
  export function useEffect(effect: EffectCallback, deps?: DependencyList): void;
  export function useMemo<T>(factory: () => T, deps: DependencyList): T;
  export function useSyncExternalStore<Snapshot>(
    subscribe: (onStoreChange: () => void) => () => void,
    getSnapshot: () => Snapshot,
    getServerSnapshot?: () => Snapshot,
  ): Snapshot;
  export namespace JSX {
    type ElementType = string | ((props: any) => ReactNode);
    interface Element extends ReactElement<any> {}
    interface ElementAttributesProperty { props: {} }
    interface ElementChildrenAttribute { children: {} }
    interface IntrinsicAttributes { key?: Key | null | undefined }
    interface IntrinsicElements { [tag: string]: { children?: ReactNode; [attribute: string]: unknown } }
  }
}

declare module "react/jsx-runtime" {
  import type { JSX as ReactJSX, Key, ReactElement } from "react";
  export namespace JSX {
    type ElementType = ReactJSX.ElementType;
    interface Element extends ReactJSX.Element {}
    interface ElementAttributesProperty extends ReactJSX.ElementAttributesProperty {}
    interface ElementChildrenAttribute extends ReactJSX.ElementChildrenAttribute {}
    interface IntrinsicAttributes extends ReactJSX.IntrinsicAttributes {}
    interface IntrinsicElements extends ReactJSX.IntrinsicElements {}
  }
  export function jsx(type: unknown, props: unknown, key?: Key): ReactElement;
  export function jsxs(type: unknown, props: unknown, key?: Key): ReactElement;
  export const Fragment: unique symbol;
}

// What Vite's client types declare for the example's import.meta.env.VITE_API_URL.
interface ImportMetaEnv { readonly [key: `VITE_${string}`]: string | undefined }
interface ImportMeta { readonly env: ImportMetaEnv }
