// Where a runtime's state holds what its JSON does not give back as it is, which the next
// batch would not see: evaluated before the user's module runs, so it works with the
// intrinsics as the engine made them. Called only for a state the engine's own writer refused
// (`state.rs`); returns a description of the first such place, or null.
(() => {
  const { getPrototypeOf, getOwnPropertyNames, getOwnPropertyDescriptor } = Object;
  const objectPrototype = Object.prototype;
  const arrayPrototype = Array.prototype;
  const isArray = Array.isArray;
  const isFinite = Number.isFinite;
  const quote = JSON.stringify;
  const identifier = /^[A-Za-z_$][A-Za-z0-9_$]*$/;
  const test = RegExp.prototype.test;
  // Deeper than this the engine's JSON.stringify judges alone (it stops at a cycle).
  const MAX_DEPTH = 200;

  const member = (path, key) =>
    test.call(identifier, key) ? `${path}.${key}` : `${path}[${quote(key)}]`;

  // `a Set`, `a Date`, `an instance of Point`: what a value of another prototype is.
  const kind = (value) => {
    const prototype = getPrototypeOf(value);
    if (prototype === null) return 'an object without a prototype';
    const constructor = getOwnPropertyDescriptor(prototype, 'constructor');
    const name = constructor && typeof constructor.value === 'function' && constructor.value.name;
    if (!name) return 'an object of another prototype';
    return `${test.call(/^[AEIO]/, name) ? 'an' : 'a'} ${name}`;
  };

  const hasToJSON = (value) => {
    for (let o = value; o !== null; o = getPrototypeOf(o)) {
      if (getOwnPropertyDescriptor(o, 'toJSON')) return true;
    }
    return false;
  };

  const walk = (value, path, depth, ancestors) => {
    switch (typeof value) {
      case 'number':
        return isFinite(value) ? null : `${path} is ${value}, which JSON keeps as null`;
      case 'bigint':
        return `${path} is a BigInt, which JSON cannot hold`;
      case 'function':
        return `${path} is a function, which JSON does not keep`;
      case 'object':
        break;
      default:
        return null;
    }
    if (value === null || depth > MAX_DEPTH) return null;
    if (ancestors.includes(value)) return `${path} is an object that contains itself`;
    const prototype = getPrototypeOf(value);
    const array = isArray(value);
    if (prototype !== (array ? arrayPrototype : objectPrototype)) {
      return `${path} is ${kind(value)}, which JSON does not keep as it is`;
    }
    if (hasToJSON(value)) {
      return `${path} has a toJSON method (its own or its prototype's): JSON keeps what it returns`;
    }
    ancestors.push(value);
    try {
      if (array) {
        for (let i = 0; i < value.length; i++) {
          const at = `${path}[${i}]`;
          const property = getOwnPropertyDescriptor(value, i);
          if (!property) return `${at} is a hole, which JSON keeps as null`;
          if (property.get || property.set) return `${at} is a getter or setter`;
          if (property.value === undefined || typeof property.value === 'symbol') {
            return `${at} is ${typeof property.value}, which JSON keeps as null`;
          }
          const lost = walk(property.value, at, depth + 1, ancestors);
          if (lost) return lost;
        }
        return null;
      }
      for (const key of getOwnPropertyNames(value)) {
        const property = getOwnPropertyDescriptor(value, key);
        if (!property.enumerable) continue;
        const at = member(path, key);
        if (property.get || property.set) return `${at} is a getter or setter`;
        const lost = walk(property.value, at, depth + 1, ancestors);
        if (lost) return lost;
      }
      return null;
    } finally {
      ancestors.pop();
    }
  };

  return (state) => walk(state, 'state', 0, []);
})()
